//! What the kubelet and an operator read when something goes wrong, from the daemon as a
//! process: errors that keep the operating system's reason, and values from a hostile request
//! echoed bounded and escaped, in both log formats.

use std::process::Command;

use crate::common::process::{DRIVER, Env, stop};
use kubedev_testkit::kubelet::ClaimId;

/// The longest error or log line a hostile request may cause.
const MAX_LINE: usize = 1024;

/// A log line with a raw control character (other than a tab) in it.
fn raw_control(line: &str) -> Option<char> {
    line.chars().find(|&c| c.is_control() && c != '\t')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_claim_references_come_back_bounded_and_escaped() {
    for format in ["text", "json"] {
        let env = Env::new().await;
        let daemon = env.start_logging(format, "info").await;
        let huge = "u".repeat(1 << 20);
        let claims = [
            ClaimId::new("default", "train", &huge),
            ClaimId::new("de\0fault", "nul", "uid-nul"),
            ClaimId::new("default\nERROR kubedev: forged", "newline", "uid-newline"),
            ClaimId::new("default", "esc\x1b[2J\x1b[31m", "uid-escape"),
        ];
        let out = env.kubelet.prepare(DRIVER, &claims).await.unwrap();

        let err = out[&huge].as_ref().unwrap_err();
        assert!(err.len() < MAX_LINE, "{format}: a {} byte error", err.len());
        assert!(err.contains("(1048576 bytes)"), "{err}");
        for (uid, field, escaped) in [
            ("uid-nul", "namespace", "\"de\\u{0}fault\""),
            (
                "uid-newline",
                "namespace",
                "\"default\\nERROR kubedev: forged\"",
            ),
            ("uid-escape", "name", "\"esc\\u{1b}[2J\\u{1b}[31m\""),
        ] {
            let err = out[uid].as_ref().unwrap_err();
            assert!(err.contains("claims[") && err.contains(field), "{err}");
            assert!(err.contains(escaped), "{format}: {err}");
            assert_eq!(raw_control(err), None, "{err:?}");
        }
        stop(daemon);

        let log = env.log_text();
        let refusals: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("malformed claim reference"))
            .collect();
        assert_eq!(
            refusals.len(),
            4,
            "{format}: one WARN line per claim:\n{log}"
        );
        for line in log.lines() {
            assert!(
                line.len() < MAX_LINE,
                "{format}: a {} byte log line",
                line.len()
            );
            assert_eq!(raw_control(line), None, "{format}: {line:?}");
            assert!(!line.starts_with("ERROR kubedev: forged"), "{line}");
            if format == "json" {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            }
        }
        assert!(
            refusals.iter().any(|l| l.contains("(1048576 bytes)")),
            "{refusals:?}"
        );
        assert!(
            refusals.iter().any(|l| l.contains("ERROR kubedev: forged")),
            "the forged text stays in its own line, escaped: {refusals:?}"
        );
    }
}

/// With the CDI directory on a full file system, the kubelet's error for the claim and the
/// daemon's log say why; once space is freed the same prepare succeeds. Mounts a small tmpfs
/// over the CDI directory in a private mount namespace (`unshare`), so it needs root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a tmpfs in a private mount namespace"]
async fn a_full_disk_is_named_to_the_kubelet_and_in_the_log() {
    const REASON: &str = "No space left on device (os error 28)";
    let env = Env::new().await;
    let cdi = env.root.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.env("RUST_LOG", "warn").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        // Fill the file system so that not even an empty spec's temporary file fits.
        "mount -t tmpfs -o size=64k tmpfs \"$1\" && { head -c 1M /dev/zero > \"$1/fill\" || true; } && shift && exec \"$@\"",
        "sh",
    ]);
    cmd.arg(&cdi).arg(env!("CARGO_BIN_EXE_kubedev"));
    let daemon = env.start_command(cmd, "", &[]).await;

    let claim = env.claim("train", "claim-uid-1", &["gpu-0"]);
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    let err = out["claim-uid-1"].as_ref().unwrap_err();
    assert!(err.contains(REASON), "the kubelet's error: {err}");
    assert!(err.contains("default/train"), "{err}");
    let log = env.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("prepare failed") && l.contains(REASON)),
        "the daemon's log:\n{log}"
    );
    assert!(env.checkpoint().is_empty(), "{:?}", env.checkpoint());

    // Free the space inside the daemon's mount namespace: the same prepare now succeeds.
    let pid = daemon.0.id().to_string();
    let freed = Command::new("nsenter")
        .args(["-t", &pid, "-m", "rm", "-f"])
        .arg(cdi.join("fill"))
        .status()
        .unwrap();
    assert!(freed.success());
    let out = env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(out["claim-uid-1"].is_ok(), "{out:?}");
    stop(daemon);
}
