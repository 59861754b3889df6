//! deploy-check's start test: the daemon, on a configuration the chart rendered, starts and
//! registers with the emulated kubelet (both APIs) and API server, with `POD_UID` and
//! `NODE_NAME` set as the DaemonSet sets them and the kubelet's directories as long as
//! `/var/lib/kubelet`, so socket paths are as long as on a node; then its `/metrics` is read
//! over HTTP, for the observability checks.
//!
//! Only the paths are moved: the kubelet directory to a directory of the same length, the CDI
//! and state directories and the host root to scratch directories (the host root with the
//! device nodes the host backend offers), the metrics port to a free one; the API server is
//! reached through a kubeconfig instead of the in-cluster account.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kubedev_testkit::apiserver::{ApiServer, Resource};
use kubedev_testkit::hostroot::HostRoot;
use kubedev_testkit::kubelet::{DraKubelet, KubeletEmulator};
use serde_json::{Value, json};

/// The kubelet directory the chart's default values name.
const KUBELET_DIR: &str = "/var/lib/kubelet";
const NODE: &str = "deploy-check-node";
const POD_UID: &str = "0b6e4f8e-5a8c-4c2e-9a55-3f1d2c7e9b10";
const WAIT: Duration = Duration::from_secs(30);

/// Starts `kubedev` on `config` (the chart's `config.yaml`, as JSON), waits until the DRA
/// driver (when enabled) and every device-plugin resource are registered, and returns what its
/// `/metrics` endpoint then serves.
pub(super) fn starts_and_registers(kubedev: &Path, config: &Value) -> anyhow::Result<String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(kubedev, config))
}

/// A fresh directory exactly as long as `/var/lib/kubelet`.
fn kubelet_length_dir() -> anyhow::Result<PathBuf> {
    for _ in 0..100 {
        let dir = PathBuf::from(format!("/tmp/kdvd-{:06x}", fastrand::u32(..0x100_0000)));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!("could not create a fresh /tmp/kdvd-* directory")
}

/// Every string under `value` that starts with `from`, moved under `to`.
fn move_paths(value: &mut Value, from: &str, to: &str) {
    match value {
        Value::String(s) if s.starts_with(from) => *s = format!("{to}{}", &s[from.len()..]),
        Value::Array(items) => items.iter_mut().for_each(|v| move_paths(v, from, to)),
        Value::Object(map) => map.values_mut().for_each(|v| move_paths(v, from, to)),
        _ => {}
    }
}

async fn run(kubedev: &Path, config: &Value) -> anyhow::Result<String> {
    let kubelet_dir = kubelet_length_dir()?;
    let result = run_in(kubedev, config, &kubelet_dir).await;
    let _ = std::fs::remove_dir_all(&kubelet_dir);
    result
}

async fn run_in(kubedev: &Path, config: &Value, kubelet_dir: &Path) -> anyhow::Result<String> {
    let scratch = tempfile::tempdir()?;
    let host = HostRoot::new()?;
    for node in ["/dev/kvm", "/dev/net/tun", "/dev/vhost-net"] {
        host.device_node(node)?;
    }
    let api = ApiServer::start().await?;
    let kubeconfig = scratch.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    api.put_raw(
        Resource::Nodes,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}),
    )?;

    let config = moved_config(
        config,
        kubelet_dir,
        host.path(),
        scratch.path(),
        &kubeconfig,
    )?;
    let expected = ExpectedRegistrations::of(&config);

    let device_plugins = kubelet_dir.join("device-plugins");
    std::fs::create_dir_all(&device_plugins)?;
    let dp_kubelet = KubeletEmulator::start(&device_plugins).await?;
    let dra_kubelet = DraKubelet::start(kubelet_dir.join("plugins_registry"))?;

    // JSON is YAML: the daemon reads it as its configuration file.
    let file = scratch.path().join("config.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&config)?)?;
    let log = scratch.path().join("kubedev.log");
    let mut daemon = Command::new(kubedev)
        .args(["run", "--config"])
        .arg(&file)
        .env("NODE_NAME", NODE)
        .env("POD_UID", POD_UID)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", kubedev.display()))?;

    let mut outcome = expected
        .wait(&mut daemon, &dp_kubelet, &dra_kubelet)
        .await?;
    let mut metrics = String::new();
    if outcome.is_ok() {
        let address = config["metrics"]["address"].as_str().unwrap_or_default();
        let scraped = {
            let address = address.to_string();
            tokio::task::spawn_blocking(move || {
                crate::commands::http_get(&address, "/metrics", Duration::from_secs(10))
            })
            .await
            .context("the scrape task stopped")
            .and_then(|r| r)
        };
        match scraped {
            Ok(text) => metrics = text,
            Err(e) => outcome = Err(format!("reading http://{address}/metrics: {e:#}")),
        }
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    dra_kubelet.stop().await;
    dp_kubelet.stop().await;
    if let Err(e) = outcome {
        let printed = std::fs::read_to_string(&log).unwrap_or_default();
        bail!("{e}; the daemon said:\n{}", printed.trim());
    }
    Ok(metrics)
}

/// The chart's configuration with only the paths moved (see the module docs): the kubelet
/// directory to `kubelet_dir`, the host root to `host_root`, the state and CDI directories
/// beneath `scratch`, the metrics port to a free one, and the API server reached through
/// `kubeconfig`.
fn moved_config(
    config: &Value,
    kubelet_dir: &Path,
    host_root: &Path,
    scratch: &Path,
    kubeconfig: &Path,
) -> anyhow::Result<Value> {
    let mut config = config.clone();
    move_paths(&mut config, KUBELET_DIR, &kubelet_dir.display().to_string());
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    config["hostRoot"] = json!(host_root);
    config["stateDir"] = json!(scratch.join("state"));
    config["metrics"]["address"] = json!(format!("127.0.0.1:{port}"));
    let cdi = scratch.join("cdi");
    if config["dra"]["enabled"] == json!(true) {
        config["dra"]["cdiDir"] = json!(cdi);
        config["dra"]["kubeconfig"] = json!(kubeconfig);
        config["dra"]["bootIdPath"] = json!(scratch.join("boot_id"));
        std::fs::write(
            scratch.join("boot_id"),
            "d0000000-0000-4000-8000-000000000001\n",
        )?;
    }
    if config["devicePlugin"]["enabled"] == json!(true) {
        config["devicePlugin"]["cdiDir"] = json!(cdi);
    }
    Ok(config)
}

/// What the daemon must register with the emulated kubelet on a configuration.
struct ExpectedRegistrations {
    /// Whether DRA is enabled, and its driver's name.
    dra_enabled: bool,
    driver: Option<String>,
    /// The device-plugin resources.
    resources: Vec<String>,
}

impl ExpectedRegistrations {
    fn of(config: &Value) -> ExpectedRegistrations {
        let resources: Vec<String> = config["devicePlugin"]["resources"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|r| r["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        ExpectedRegistrations {
            dra_enabled: config["dra"]["enabled"] == json!(true),
            driver: config["dra"]["driverName"].as_str().map(str::to_string),
            resources,
        }
    }

    /// Waits until every expected registration arrived: `Ok(Err(why))` when the daemon exited
    /// first or [`WAIT`] passed.
    async fn wait(
        &self,
        daemon: &mut Child,
        dp_kubelet: &KubeletEmulator,
        dra_kubelet: &DraKubelet,
    ) -> anyhow::Result<Result<(), String>> {
        let started = Instant::now();
        loop {
            if let Some(status) = daemon.try_wait()? {
                return Ok(Err(format!("the daemon exited with {status}")));
            }
            let dra_ok = match &self.driver {
                Some(d) if self.dra_enabled => dra_kubelet.drivers().contains_key(d),
                _ => true,
            };
            let registered = dp_kubelet.registrations();
            let dp_missing: Vec<&String> = self
                .resources
                .iter()
                .filter(|r| {
                    !registered
                        .iter()
                        .any(|rec| &rec.resource == *r && rec.rejected.is_none())
                })
                .collect();
            if dra_ok && dp_missing.is_empty() {
                return Ok(Ok(()));
            }
            if started.elapsed() > WAIT {
                return Ok(Err(format!(
                    "not registered within {WAIT:?}: DRA driver {} {}, device-plugin resources \
                     missing {dp_missing:?}; DRA registrations rejected: {:?}",
                    self.driver.as_deref().unwrap_or("-"),
                    if dra_ok {
                        "registered"
                    } else {
                        "not registered"
                    },
                    dra_kubelet.rejected()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
