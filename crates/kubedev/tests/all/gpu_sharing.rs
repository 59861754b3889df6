//! Opaque configuration and GPU sharing through the `kubedev` binary, the API-server emulator
//! and the NVML stand-in: a class's and a claim's `GpuConfig` reach the NVIDIA backend in
//! precedence order (the claim's MPS wins over the class's time-slicing); the claim's MPS
//! control daemon runs with its settings until unprepare; a bad entry fails only its own claim,
//! naming the entry and the field; a crash in the middle of a prepare leaves no daemon behind
//! once the daemon restarts, and a daemon lost while kubedev was down is started again.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::process::{DRIVER, Env, stop, wait_exit};
use kubedev_testkit::apiserver::Resource;
use kubedev_testkit::kubelet::ClaimId;
use serde_json::{Value, json};

const POOL: &str = "node-a-nvidia";
const API: &str = "gpu.kubedev.io/v1alpha1";

struct Gpus {
    env: Env,
    mps: PathBuf,
}

async fn gpus() -> Gpus {
    let env = Env::new().await;
    let r = env.root.path().to_path_buf();
    let lib = nvml_mock::isolated_library(&r, &nvml_mock::machine_path("dgx-a100"), None).unwrap();
    let smi = nvml_mock::tools::smi_wrapper(
        &r.join("nvidia-smi"),
        &r.join("gpu-settings.json"),
        &nvml_mock::machine_path("dgx-a100"),
    )
    .expect("run `cargo build -p kubedev-nvml-mock` first");
    let mps = nvml_mock::tools::tool_path("mock-nvidia-cuda-mps-control").unwrap();
    env.edit_config(|c| {
        format!(
            "stateDir: {r}/node-state\n{c}  nvidia:\n    libraryPath: {}\n    nvidiaSmiPath: {}\n    mpsControlPath: {}\n",
            lib.display(),
            smi.display(),
            mps.display(),
            r = r.display()
        )
    });
    Gpus { env, mps }
}

impl Gpus {
    fn mps_dir(&self, uid: &str) -> PathBuf {
        self.env.root.path().join("node-state/nvidia/mps").join(uid)
    }

    /// Asks the claim's MPS daemon for its active-thread percentage, as a client would.
    fn percentage(&self, uid: &str) -> Option<String> {
        use std::io::Write;
        let mut child = Command::new(&self.mps)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.mps_dir(uid).join("pipe"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A client that finds no daemon exits without reading: a failed write says the same.
        let _ = child
            .stdin
            .take()
            .unwrap()
            .write_all(b"get_default_active_thread_percentage\n");
        let out = child.wait_with_output().unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Stops the claim's MPS daemon behind kubedev's back.
    fn kill_mps(&self, uid: &str) {
        let pid =
            std::fs::read_to_string(self.mps_dir(uid).join("pipe/nvidia-cuda-mps-control.pid"))
                .unwrap();
        let pid = rustix::process::Pid::from_raw(pid.trim().parse().unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        std::fs::remove_file(self.mps_dir(uid).join("pipe/control")).unwrap();
    }

    /// A claim allocated `gpu-0` of the NVIDIA pool with the class's and the claim's
    /// configuration entries `config`.
    fn claim(&self, name: &str, uid: &str, device: &str, config: Value) -> ClaimId {
        self.env
            .api
            .put_raw(
                Resource::ResourceClaims,
                json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default", "uid": uid},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
                    "status": {"allocation": {"devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": POOL, "device": device}],
                        "config": config
                    }}}
                }),
            )
            .unwrap();
        ClaimId::new("default", name, uid)
    }
}

fn entry(source: &str, sharing: Value) -> Value {
    json!({"source": source, "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}}})
}

fn mps(percentage: i64) -> Value {
    json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_and_claim_configuration_share_a_gpu_through_mps() {
    let g = gpus().await;
    let daemon = g.env.start("").await;
    // The claim's entry comes first in the list but the class's is applied first: the claim's
    // MPS wins over the class's time-slicing.
    let good = g.claim(
        "mps",
        "uid-mps",
        "gpu-0",
        json!([
            entry("FromClaim", mps(30)),
            entry("FromClass", json!({"strategy": "TimeSlicing"}))
        ]),
    );
    let bad = g.claim(
        "bad",
        "uid-bad",
        "gpu-1",
        json!([entry(
            "FromClass",
            json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}})
        )]),
    );
    let out = g
        .env
        .kubelet
        .prepare(DRIVER, &[good.clone(), bad.clone()])
        .await
        .unwrap();
    assert!(out["uid-mps"].is_ok(), "{out:?}");
    let err = out["uid-bad"].as_ref().unwrap_err();
    assert!(
        err.contains("config[0] (from the device class): sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got 101"),
        "{err}"
    );
    assert_eq!(g.percentage("uid-mps").as_deref(), Some("30"));
    assert!(!g.mps_dir("uid-bad").exists());
    let spec = std::fs::read_to_string(
        g.env
            .root
            .path()
            .join(format!("cdi/k8s.{DRIVER}-claim_uid-mps.json")),
    )
    .unwrap();
    assert!(
        spec.contains("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
        "{spec}"
    );

    let out = g
        .env
        .kubelet
        .unprepare(DRIVER, std::slice::from_ref(&good))
        .await
        .unwrap();
    assert!(out["uid-mps"].is_ok(), "{out:?}");
    assert!(!g.mps_dir("uid-mps").exists(), "nothing is left");
    assert_eq!(g.percentage("uid-mps"), None);
    stop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_mps_daemon_outlives_a_crash_and_a_lost_one_comes_back() {
    let g = gpus().await;
    // kubedev dies after the backend started the daemon, before the prepare completed.
    let mut daemon = g.env.start("after-device-prepare").await;
    let half = g.claim(
        "half",
        "uid-half",
        "gpu-0",
        json!([entry("FromClaim", mps(20))]),
    );
    assert!(
        g.env
            .kubelet
            .prepare(DRIVER, std::slice::from_ref(&half))
            .await
            .is_err()
    );
    assert!(!wait_exit(&mut daemon).success());
    assert_eq!(
        g.percentage("uid-half").as_deref(),
        Some("20"),
        "the crash left it running"
    );

    // The restart rolls the prepare back: the daemon is stopped and its files removed.
    let daemon = g.env.start("").await;
    assert_eq!(g.percentage("uid-half"), None);
    assert!(!g.mps_dir("uid-half").exists());

    // A prepared claim whose daemon died while kubedev was down gets it back at start-up.
    let done = g.claim(
        "done",
        "uid-done",
        "gpu-1",
        json!([entry("FromClaim", mps(60))]),
    );
    let out = g
        .env
        .kubelet
        .prepare(DRIVER, std::slice::from_ref(&done))
        .await
        .unwrap();
    assert!(out["uid-done"].is_ok(), "{out:?}");
    stop(daemon);
    g.kill_mps("uid-done");
    assert_eq!(g.percentage("uid-done"), None);
    let daemon = g.env.start("").await;
    assert_eq!(g.percentage("uid-done").as_deref(), Some("60"));
    let out = g
        .env
        .kubelet
        .unprepare(DRIVER, std::slice::from_ref(&done))
        .await
        .unwrap();
    assert!(out["uid-done"].is_ok(), "{out:?}");
    assert!(!g.mps_dir("uid-done").exists());
    stop(daemon);
}
