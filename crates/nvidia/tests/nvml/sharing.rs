//! GPU sharing per claim through the NVML stand-in's tools: MPS starts one control daemon per
//! claim with the configured limits and stops it on unprepare, also from a fresh backend after a
//! crash; time-slicing sets and resets each GPU's time-slice; a bad configuration is an error
//! naming the field, with nothing changed on the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kubedev_core::{
    AllocatedDevice, ClaimRef, ConfigSource, Consumer, DeviceConfig, DeviceName, DeviceRef,
    DeviceSource, PoolName, PrepareError, Preparer,
};
use kubedev_nvidia::sharing::CONFIG_API_VERSION;
use nvml_mock::tools::smi::{GpuSettings, read_settings};
use serde_json::json;

use super::Fixture;

struct World {
    f: Fixture,
    settings: PathBuf,
    mps: PathBuf,
}

/// The fixture with `nvidia-smi` and the MPS control program of the stand-in; `nvidia-smi` is
/// a wrapper naming the settings file and machine, as a node's driver installation would.
fn world() -> World {
    let f = Fixture::new("dgx-a100");
    let settings = f.dir.path().join("gpu-settings.json");
    let mps = nvml_mock::tools::tool_path("mock-nvidia-cuda-mps-control")
        .expect("run `cargo build -p kubedev-nvml-mock` first");
    nvml_mock::tools::smi_wrapper(
        &f.dir.path().join("nvidia-smi"),
        &settings,
        &nvml_mock::machine_path("dgx-a100"),
    )
    .unwrap();
    World { f, settings, mps }
}

impl World {
    fn backend(&self) -> kubedev_nvidia::NvidiaBackend {
        self.f.backend(kubedev_nvidia::NvidiaConfig {
            nvidia_smi_path: self.f.dir.path().join("nvidia-smi"),
            mps_control_path: self.mps.clone(),
            ..self.f.config()
        })
    }

    fn settings(&self) -> BTreeMap<String, GpuSettings> {
        read_settings(&self.settings).unwrap()
    }

    fn mps_dir(&self, claim: &ClaimRef) -> PathBuf {
        self.f.ctx.state_dir.join("mps").join(claim.uid.as_str())
    }

    /// Sends `input` to the claim's MPS daemon through the client, as a container would.
    fn ask(&self, claim: &ClaimRef, input: &str) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(&self.mps)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.mps_dir(claim).join("pipe"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A client that finds no daemon exits without reading: its error says so below.
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef::parse(uid, "default", &format!("claim-{uid}")).unwrap()
}

fn gpus(names: &[&str], sharing: serde_json::Value) -> Vec<AllocatedDevice> {
    names
        .iter()
        .map(|n| {
            AllocatedDevice::new(DeviceRef::new(
                PoolName::new("node-a-nvidia").unwrap(),
                DeviceName::new(*n).unwrap(),
            ))
            .with_request("gpu")
            .with_config(vec![DeviceConfig::new(
                ConfigSource::Claim,
                0,
                json!({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": sharing}),
            )])
        })
        .collect()
}

fn pid_alive(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join("pipe/nvidia-cuda-mps-control.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    (!stat.rsplit_once(") ").unwrap().1.starts_with('Z')).then_some(pid)
}

#[tokio::test]
async fn an_mps_claim_runs_its_own_control_daemon_until_unprepared() {
    let w = world();
    let b = w.backend();
    b.discover().await.unwrap();
    let c = claim("uid-mps");
    let devices = gpus(
        &["gpu-0", "gpu-1"],
        json!({"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 40,
            "defaultPinnedDeviceMemoryLimit": "2Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}
        }}),
    );
    let prepared = b
        .prepare(&Consumer::Claim(c.clone()), &devices)
        .await
        .unwrap();
    let uuids: Vec<String> = prepared
        .iter()
        .map(|p| {
            p.status_data.as_ref().unwrap()["gpuUUID"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut sorted = uuids.clone();
    sorted.sort();

    // The first device carries the pipe directory and its variable; the data says MPS.
    let pipe = w.mps_dir(&c).join("pipe");
    let edits = &prepared[0].edits;
    assert_eq!(edits.env["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps");
    assert!(
        edits
            .mounts
            .iter()
            .any(|m| m.host_path == pipe.display().to_string()
                && m.container_path == "/tmp/nvidia-mps"),
        "{edits:?}"
    );
    assert_eq!(prepared[1].status_data.as_ref().unwrap()["sharing"], "MPS");

    // The daemon answers with the claim's settings.
    assert_eq!(
        w.ask(&c, "get_default_active_thread_percentage\n").unwrap(),
        "40\n"
    );
    assert_eq!(
        w.ask(
            &c,
            &format!("get_default_device_pinned_mem_limit {}\n", sorted[0])
        )
        .unwrap(),
        "2048M\n"
    );
    assert_eq!(
        w.ask(
            &c,
            &format!("get_default_device_pinned_mem_limit {}\n", sorted[1])
        )
        .unwrap(),
        "1024M\n",
        "index 1 of the claim's GPUs sorted by UUID"
    );
    let log = std::fs::read_to_string(w.mps_dir(&c).join("log/control.log")).unwrap();
    assert!(
        log.contains(&format!("CUDA_VISIBLE_DEVICES={}", sorted.join(","))),
        "{log}"
    );
    for u in &uuids {
        assert_eq!(
            w.settings()[u].compute_mode.as_deref(),
            Some("EXCLUSIVE_PROCESS")
        );
    }
    let pid = pid_alive(&w.mps_dir(&c)).expect("the daemon runs");

    // Preparing again (a kubelet retry) keeps the same daemon.
    b.prepare(&Consumer::Claim(c.clone()), &devices)
        .await
        .unwrap();
    assert_eq!(pid_alive(&w.mps_dir(&c)), Some(pid));

    b.unprepare(&c, &devices).await.unwrap();
    assert!(!w.mps_dir(&c).exists(), "its directories are removed");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon is gone, not even a zombie: the backend reaps what it started"
    );
    assert!(w.ask(&c, "get_default_active_thread_percentage\n").is_err());
    for u in &uuids {
        assert_eq!(w.settings()[u].compute_mode.as_deref(), Some("DEFAULT"));
    }
}

#[tokio::test]
async fn after_a_crash_a_fresh_backend_stops_the_daemon_it_did_not_start() {
    let w = world();
    let c = claim("uid-crash");
    let devices = gpus(&["gpu-2"], json!({"strategy": "MPS"}));
    let pid = {
        let b = w.backend();
        b.discover().await.unwrap();
        b.prepare(&Consumer::Claim(c.clone()), &devices)
            .await
            .unwrap();
        pid_alive(&w.mps_dir(&c)).unwrap()
        // The backend goes away; the daemon, in its own process group, keeps running.
    };
    assert_eq!(pid_alive(&w.mps_dir(&c)), Some(pid));
    let b = w.backend();
    b.discover().await.unwrap();
    b.unprepare(&c, &devices).await.unwrap();
    assert!(!w.mps_dir(&c).exists());
    assert!(w.ask(&c, "get_default_active_thread_percentage\n").is_err());
}

#[tokio::test]
async fn time_slicing_sets_and_resets_each_gpus_time_slice() {
    let w = world();
    let b = w.backend();
    b.discover().await.unwrap();
    let c = claim("uid-ts");
    let devices = gpus(
        &["gpu-3"],
        json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    );
    let prepared = b
        .prepare(&Consumer::Claim(c.clone()), &devices)
        .await
        .unwrap();
    let uuid = prepared[0].status_data.as_ref().unwrap()["gpuUUID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        w.settings()[&uuid],
        GpuSettings {
            compute_mode: Some("DEFAULT".into()),
            timeslice: Some(3)
        }
    );
    assert!(!w.mps_dir(&c).exists(), "no MPS daemon for time-slicing");
    b.unprepare(&c, &devices).await.unwrap();
    assert_eq!(w.settings()[&uuid].timeslice, Some(0));
}

#[tokio::test]
async fn a_bad_configuration_names_the_field_and_changes_nothing() {
    let w = world();
    let b = w.backend();
    b.discover().await.unwrap();
    let c = claim("uid-bad");
    let devices = gpus(
        &["gpu-0"],
        json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 140}}),
    );
    let err = b
        .prepare(&Consumer::Claim(c.clone()), &devices)
        .await
        .unwrap_err();
    assert!(matches!(err, PrepareError::Config { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains(
            "config[0] (from the claim): sharing.mpsConfig.defaultActiveThreadPercentage: must be from 0 to 100, got 140"
        ),
        "{err}"
    );
    let devices = gpus(
        &["gpu-0"],
        json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "1Gi"}}}),
    );
    let err = b
        .prepare(&Consumer::Claim(c.clone()), &devices)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.GPU-nope"),
        "{err}"
    );
    assert!(!w.mps_dir(&c).exists());
    assert!(w.settings().is_empty(), "{:?}", w.settings());
}
