//! Start-up of the daemon binary when a policy module would take minutes to compile: the
//! daemon serves and registers at once, `/readyz` follows its servers, and SIGTERM stops it.
//! And the environment it runs in: glibc's malloc held to two arenas unless the operator says
//! otherwise.

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

/// The environment variable `name` of process `pid`, from `/proc/<pid>/environ`.
fn environ_var(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_string)
}

/// Over a million claims, the daemon's resident memory settled 2.8 MiB above where it
/// started with glibc's default of 16 arenas on 2 CPUs (its threads for blocking work come and
/// go), 0.4 MiB with two: `kubedev run` runs itself again with `MALLOC_ARENA_MAX=2`, keeping
/// its process ID and registering as usual, and leaves an operator's own value alone.
#[cfg(target_env = "gnu")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_limits_malloc_arenas_unless_the_operator_set_them() {
    use crate::common::process::{Env, stop};
    let env = Env::new().await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubedev"));
    cmd.env_remove("MALLOC_ARENA_MAX");
    let daemon = env.start_command(cmd, "", &[]).await;
    assert_eq!(
        environ_var(daemon.0.id(), "MALLOC_ARENA_MAX").as_deref(),
        Some("2"),
        "the registered daemon runs with two arenas"
    );
    stop(daemon);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubedev"));
    cmd.env("MALLOC_ARENA_MAX", "8");
    let daemon = env.start_command(cmd, "", &[]).await;
    assert_eq!(
        environ_var(daemon.0.id(), "MALLOC_ARENA_MAX").as_deref(),
        Some("8")
    );
    stop(daemon);
}
