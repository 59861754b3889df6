//! Start-up of the daemon binary when a policy module would take minutes to compile: the
//! daemon serves and registers at once, `/readyz` follows its servers, and SIGTERM stops it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use kubedev_testkit::kubelet::KubeletEmulator;

const WAIT: Duration = Duration::from_secs(20);

/// A 300 KB module of 100 000 nested blocks took 167 s to compile, and the daemon compiled the
/// whole policy directory before serving (even modules no resource names) while `/readyz`
/// said 200 and SIGTERM waited. Now the module is refused by its shape in milliseconds, the
/// directory loads off the start-up path, and the daemon registers, gets ready and stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_that_would_compile_for_minutes_does_not_hold_up_start_or_stop() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let dp = r.join("dp");
    let policies = r.join("policies");
    std::fs::create_dir_all(&dp).unwrap();
    std::fs::create_dir_all(&policies).unwrap();
    let depth = 100_000;
    let body = format!("{}{}", "block ".repeat(depth), "end ".repeat(depth));
    let nested = wat::parse_str(format!("(module (func {body}))")).unwrap();
    std::fs::write(policies.join("nested.wasm"), nested).unwrap();
    std::fs::copy(
        common::plugin("numa-pack"),
        policies.join("gpu-choice.wasm"),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = r.join("kubedev.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: node-a\nstateDir: {r}/state\nmetrics:\n  address: 127.0.0.1:{port}\ndevicePlugin:\n  directory: {dp}\n  policyDir: {policies}\n  resources:\n    - name: example.com/gpu\n      policy: gpu-choice\nbackends:\n  static:\n    pool: node-a\n    devices:\n      - name: gpu-0\n      - name: gpu-1\n",
            r = r.display(),
            dp = dp.display(),
            policies = policies.display(),
        ),
    )
    .unwrap();
    let kubelet = KubeletEmulator::start(&dp).await.unwrap();
    let log = r.join("daemon.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubedev"))
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let registered = kubelet
        .wait_for("example.com/gpu", WAIT, |s| s.connected && s.capacity == 2)
        .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        registered.is_some(),
        "not registered within {WAIT:?}: {text}"
    );
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = common::http_get(port, "/readyz");
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz: {status} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("nests blocks more than")
    {
        assert!(
            Instant::now() < deadline,
            "the nested module was not refused: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    kubelet.stop().await;
}
