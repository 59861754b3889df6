//! `kubedev run` in DRA mode while the API server cannot be reached, run as a process: what the
//! log shows.

use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn an_unreachable_api_server_is_retried_ever_more_slowly_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        root.join("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("boot_id"),
        "0b4c6a8e-8c4f-4d7e-9f5c-1a2b3c4d5e6f\n",
    )
    .unwrap();
    let r = root.display();
    std::fs::write(
        root.join("c.yaml"),
        format!(
            "nodeName: node-a\nstateDir: {r}/state\n\
             backends:\n  static:\n    pool: node-a\n    devices:\n      - name: gpu-0\n\
             dra:\n  enabled: true\n  driverName: gpu.example.com\n  kubeconfig: {r}/kubeconfig\n  \
             pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  \
             bootIdPath: {r}/boot_id\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["run", "--config"])
        .arg(root.join("c.yaml"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attempts near 0, 0.5, 1.5 and 3.5 s; retrying about once a second would make 5 or 6.
    std::thread::sleep(Duration::from_secs(5));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let watch: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ResourceSlice watch"))
        .collect();
    assert!(
        log.contains("DRA plugin started"),
        "the daemon did not start:\n{log}"
    );
    assert_eq!(
        watch.len(),
        1,
        "one line for the first failure, then nothing for a minute:\n{log}"
    );
    assert!(
        watch[0].contains("WARN") && watch[0].contains("retry_in"),
        "{}",
        watch[0]
    );
    assert!(
        !log.lines().any(|l| l.contains("ERROR")),
        "no ERROR line for a retried request:\n{log}"
    );
}
