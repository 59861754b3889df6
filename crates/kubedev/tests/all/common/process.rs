//! The daemon as a process (the `kubedev` binary) in DRA mode against the API-server and kubelet
//! emulators: a root directory with its configuration (four static GPUs, each present while its
//! file exists), starting and stopping the process, and reading what it published.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubedev_testkit::apiserver::{ApiServer, KubeRelease, Resource};
use kubedev_testkit::kubelet::{ClaimId, DraKubelet};
use serde_json::json;

pub(crate) const DRIVER: &str = "gpu.example.com";
pub(crate) const NODE: &str = "node-a";
pub(crate) const WAIT: Duration = Duration::from_secs(20);

pub(crate) struct Env {
    pub(crate) root: tempfile::TempDir,
    pub(crate) api: ApiServer,
    pub(crate) kubelet: DraKubelet,
}

impl Env {
    pub(crate) async fn new() -> Env {
        Env::with_release(KubeRelease::NEWEST).await
    }

    /// The environment with the API server of `release` and its default feature gates.
    pub(crate) async fn with_release(release: KubeRelease) -> Env {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let api = ApiServer::builder()
            .kubernetes(release)
            .start()
            .await
            .unwrap();
        api.write_kubeconfig(&r.join("kubeconfig")).unwrap();
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}),
        )
        .unwrap();
        std::fs::write(r.join("boot_id"), "5a0c2e9f-1111-4000-8000-00000000abcd\n").unwrap();
        // Each device is present while its file under `present/` exists (see `set_present`).
        std::fs::create_dir_all(r.join("present")).unwrap();
        let devices: String = (0..4)
            .map(|i| {
                std::fs::write(r.join("present").join(format!("gpu-{i}")), "").unwrap();
                format!(
                    "      - name: gpu-{i}\n        deviceNodes: [\"/dev/null\"]\n        numaNode: {}\n        presencePath: {}/present/gpu-{i}\n",
                    i / 2,
                    r.display()
                )
            })
            .collect();
        std::fs::write(
            r.join("kubedev.yaml"),
            format!(
                "nodeName: {NODE}\ndra:\n  enabled: true\n  driverName: {DRIVER}\n  kubeconfig: {r}/kubeconfig\n  pluginDir: {r}/plugins\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  stateDir: {r}/state\n  bootIdPath: {r}/boot_id\nbackends:\n  static:\n    pool: {NODE}\n    pollIntervalMs: 20\n    devices:\n{devices}",
                r = r.display()
            ),
        )
        .unwrap();
        let kubelet = DraKubelet::start(r.join("registry")).unwrap();
        Env { root, api, kubelet }
    }

    /// Changes the daemon's configuration file (before `start`).
    #[allow(dead_code)]
    pub(crate) fn edit_config(&self, f: impl FnOnce(String) -> String) {
        let path = self.root.path().join("kubedev.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(path, f(text)).unwrap();
    }

    /// Makes device `name` present (healthy) or missing (unhealthy) for the static backend.
    pub(crate) fn set_present(&self, name: &str, present: bool) {
        let path = self.root.path().join("present").join(name);
        if present {
            std::fs::write(path, "").unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }

    pub(crate) fn claim(&self, name: &str, uid: &str, devices: &[&str]) -> ClaimId {
        let results: Vec<_> = devices
            .iter()
            .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d}))
            .collect();
        self.api
            .put_raw(
                Resource::ResourceClaims,
                json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": "default", "uid": uid},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": devices.len()}}]}},
                    "status": {"allocation": {"devices": {"results": results}}}
                }),
            )
            .unwrap();
        ClaimId::new("default", name, uid)
    }

    pub(crate) async fn start(&self, failpoints: &str) -> Daemon {
        self.start_pod(failpoints, None).await
    }

    /// Starts the daemon as the pod `pod_uid` (per-pod socket names, as during a rolling update).
    pub(crate) async fn start_pod(&self, failpoints: &str, pod_uid: Option<&str>) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubedev"));
        if let Some(uid) = pod_uid {
            cmd.env("POD_UID", uid);
        }
        self.start_command(cmd, failpoints, &[]).await
    }

    /// Starts the daemon with `log_format` (`text` or `json`) and the log filter `filter`.
    pub(crate) async fn start_logging(&self, log_format: &str, filter: &str) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubedev"));
        cmd.env("RUST_LOG", filter);
        self.start_command(cmd, "", &["--log-format", log_format])
            .await
    }

    /// Starts `cmd` (the daemon, or a program that ends by running it with the arguments it is
    /// given) with `run --config <this configuration>` and `extra` added, and waits until it has
    /// registered with the kubelet.
    pub(crate) async fn start_command(
        &self,
        mut cmd: Command,
        failpoints: &str,
        extra: &[&str],
    ) -> Daemon {
        let before = self.kubelet.registrations();
        if !cmd.get_envs().any(|(k, _)| k == "RUST_LOG") {
            cmd.env(
                "RUST_LOG",
                std::env::var("KUBEDEV_TEST_LOG").unwrap_or("error".into()),
            );
        }
        let child = Daemon(
            cmd.args(["run", "--config"])
                .arg(self.root.path().join("kubedev.yaml"))
                .args(extra)
                .env("RUST_BACKTRACE", "0")
                .env(kubedev::failpoint::ENV, failpoints)
                .stdin(Stdio::null())
                .stderr(self.log())
                .spawn()
                .unwrap(),
        );
        assert!(
            self.kubelet
                .wait_until(WAIT, |k| k.registrations() > before)
                .await,
            "daemon did not register; rejected: {:?}",
            self.kubelet.rejected()
        );
        child
    }

    /// The daemons' standard error, appended to `daemon.log` (errors only: `RUST_LOG=error`,
    /// or the filter in `KUBEDEV_TEST_LOG` when set, e.g. `kubedev=debug` to see a failing test's
    /// daemon at work).
    pub(crate) fn log(&self) -> Stdio {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join("daemon.log"))
            .unwrap()
            .into()
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(self.root.path().join("daemon.log")).unwrap_or_default()
    }

    /// Marks the claim as reserved for a pod (as the scheduler does), or clears its consumers
    /// (as the claim controller does once the pod is gone).
    pub(crate) fn reserve(&self, name: &str, pod: Option<&str>) {
        let mut claim = self
            .api
            .get(Resource::ResourceClaims, Some("default"), name)
            .unwrap();
        claim["status"]["reservedFor"] = match pod {
            Some(pod) => json!([{"resource": "pods", "name": pod, "uid": format!("{pod}-uid")}]),
            None => json!([]),
        };
        self.api.put_raw(Resource::ResourceClaims, claim).unwrap();
    }

    pub(crate) fn cdi_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.root.path().join("cdi"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p| p.extension().is_some_and(|e| e == "json"));
        v.sort();
        v
    }

    /// Claim UID → state, from the checkpoint file.
    /// Where the daemon keeps its checkpoint.
    pub(crate) fn checkpoint_path(&self) -> std::path::PathBuf {
        self.root
            .path()
            .join("state")
            .join(kubedev::checkpoint::CHECKPOINT_FILE)
    }

    pub(crate) fn checkpoint(&self) -> Vec<(String, String)> {
        let Ok(bytes) = std::fs::read(self.checkpoint_path()) else {
            return vec![];
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        v["payload"]["claims"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, c)| {
                        (
                            k.clone(),
                            c["state"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A daemon process, killed if a failing test leaves it running.
pub(crate) struct Daemon(pub(crate) Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn stop(mut daemon: Daemon) {
    let child = &mut daemon.0;
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "daemon exited with {s}");
            return;
        }
        assert!(Instant::now() < deadline, "daemon did not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn wait_exit(daemon: &mut Daemon) -> std::process::ExitStatus {
    let child = &mut daemon.0;
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "daemon did not crash");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn slices_of(api: &ApiServer) -> Vec<serde_json::Value> {
    api.objects(Resource::ResourceSlices)
        .into_iter()
        .filter(|s| s["spec"]["driver"] == DRIVER && s["spec"]["nodeName"] == NODE)
        .collect()
}
