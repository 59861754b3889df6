//! The harness the daemon's integration tests share: the daemon run in-process, a fake claim
//! source, a ResourceSlice publisher that records what it is given, configuration files, the
//! example policies, and polling with a deadline.
//!
//! Declared once in `main.rs`; each test module uses the parts it needs.
// A build without some backends (cargo features) leaves out the modules that use some of these.
#![allow(dead_code)]

pub(crate) mod process;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kubedev::config::Config;
use kubedev::dra_driver::ClaimSource;
use kubedev::runtime::{ClusterServices, run};
use kubedev_core::{
    AllocatedDevice, ClaimRef, DeviceName, DeviceRef, Inventory, PoolName, PublishError, Publisher,
    WriteCounts,
};
use kubedev_kubelet_grpc::dra::ClaimError;
use kubedev_testkit::kubelet::{DraKubelet, KubeletEmulator};
use tokio_util::sync::CancellationToken;

/// How often [`eventually`] checks again.
const POLL: Duration = Duration::from_millis(20);

/// The claims the test has allocated, as the API server would give them to the DRA driver:
/// claim UID → allocated devices. A claim the test did not allocate is an error naming it.
#[derive(Debug, Default)]
pub(crate) struct Claims(Mutex<BTreeMap<String, Vec<AllocatedDevice>>>);

impl Claims {
    /// Allocates `devices` to the claim with UID `uid` for the request `request` (no share IDs,
    /// no configuration), replacing what the claim had.
    pub(crate) fn allocate(&self, uid: &str, request: &str, devices: &[DeviceRef]) {
        let list = devices
            .iter()
            .map(|d| AllocatedDevice::new(d.clone()).with_request(request))
            .collect();
        self.0.lock().insert(uid.to_string(), list);
    }

    /// Gives the claim with UID `uid` exactly `devices` (with their requests, share IDs and
    /// configuration), replacing what it had.
    pub(crate) fn allocate_devices(&self, uid: &str, devices: Vec<AllocatedDevice>) {
        self.0.lock().insert(uid.to_string(), devices);
    }
}

#[async_trait]
impl ClaimSource for Claims {
    async fn allocated_devices(
        &self,
        claim: &ClaimRef,
    ) -> Result<Vec<AllocatedDevice>, ClaimError> {
        self.0
            .lock()
            .get(claim.uid.as_str())
            .cloned()
            .ok_or_else(|| {
                ClaimError::permanent("claim_lookup", format!("claim {claim} is not allocated"))
            })
    }
}

/// The device `name` of the pool `pool`; panics when either is not a valid name.
pub(crate) fn device(pool: &str, name: &str) -> DeviceRef {
    DeviceRef::new(
        PoolName::new(pool).expect("pool name"),
        DeviceName::new(name).expect("device name"),
    )
}

/// A ResourceSlice publisher that keeps every inventory published to it, oldest first.
///
/// It reports no API writes of its own, unless made with [`Slices::reporting_writes`].
#[derive(Debug, Default)]
pub(crate) struct Slices {
    published: Mutex<Vec<Inventory>>,
    reports_writes: bool,
}

impl Slices {
    /// One that reports API writes as a publisher writing in the background would: one create
    /// per publication, after one failed attempt.
    pub(crate) fn reporting_writes() -> Self {
        Slices {
            published: Mutex::default(),
            reports_writes: true,
        }
    }

    /// The inventory published last, if any was.
    pub(crate) fn last(&self) -> Option<Inventory> {
        self.published.lock().last().cloned()
    }

    /// How many inventories have been published.
    pub(crate) fn count(&self) -> usize {
        self.published.lock().len()
    }

    /// Waits up to `within` for a first publication and returns the latest inventory; panics
    /// when nothing is published in time.
    pub(crate) async fn wait_last(&self, within: Duration) -> Inventory {
        eventually(within, || {
            std::future::ready(
                self.last()
                    .ok_or_else(|| "nothing was published as slices".to_string()),
            )
        })
        .await
    }
}

#[async_trait]
impl Publisher for Slices {
    async fn publish(&self, inventory: &Inventory) -> Result<(), PublishError> {
        self.published.lock().push(inventory.clone());
        Ok(())
    }

    fn write_counts(&self) -> WriteCounts {
        if self.reports_writes {
            WriteCounts::new(self.count() as u64, 0, 0, 0, 1)
        } else {
            WriteCounts::default()
        }
    }
}

/// The daemon's `run`, in-process on a tokio task.
#[derive(Debug)]
pub(crate) struct Daemon {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Daemon {
    /// Runs the daemon with `config`, loaded from `path` (which it watches for changes), and
    /// the cluster services, if any.
    pub(crate) fn spawn(config: Config, path: &Path, cluster: Option<ClusterServices>) -> Self {
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let path = path.to_path_buf();
        let task = tokio::spawn(async move { run(config, &path, cluster, c).await });
        Daemon { cancel, task }
    }

    /// Stops the daemon and waits for it; panics when it ended with an error.
    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        self.task
            .await
            .expect("the daemon task")
            .expect("the daemon ends without an error");
    }
}

/// A daemon serving device-plugin resources in-process, with the kubelet emulator.
#[derive(Debug)]
pub(crate) struct DevicePluginDaemon {
    /// The kubelet's device-plugin side, watching the configured directory.
    pub(crate) kubelet: KubeletEmulator,
    daemon: Daemon,
}

impl DevicePluginDaemon {
    /// Writes the configuration `text` to `path`, starts the kubelet emulator on `dp_dir` (the
    /// configuration's `devicePlugin.directory`) and runs the daemon.
    pub(crate) async fn start(path: &Path, text: &str, dp_dir: &Path) -> Self {
        let config = write_config(path, text);
        let kubelet = KubeletEmulator::start(dp_dir)
            .await
            .expect("the kubelet emulator");
        let daemon = Daemon::spawn(config, path, None);
        DevicePluginDaemon { kubelet, daemon }
    }

    /// Waits up to `within` until the kubelet sees the device `id` of `resource` with
    /// `health`; panics when it does not.
    pub(crate) async fn wait_health(
        &self,
        resource: &str,
        id: &str,
        health: &str,
        within: Duration,
    ) {
        let seen = self
            .kubelet
            .wait_for(resource, within, |r| {
                r.devices.get(id).is_some_and(|d| d.health == health)
            })
            .await;
        assert!(seen.is_some(), "{resource} {id} never became {health}");
    }

    /// Stops the daemon, then the kubelet emulator.
    pub(crate) async fn stop(self) {
        self.daemon.stop().await;
        self.kubelet.stop().await;
    }
}

/// A daemon serving DRA in-process: the DRA kubelet emulator, the claims the test allocates and
/// the ResourceSlices the daemon publishes.
#[derive(Debug)]
pub(crate) struct DraDaemon {
    /// The kubelet's DRA side, watching `registry` below the root.
    pub(crate) kubelet: DraKubelet,
    /// The claims the driver reads.
    pub(crate) claims: Arc<Claims>,
    /// What the daemon published as ResourceSlices.
    pub(crate) slices: Arc<Slices>,
    daemon: Daemon,
}

impl DraDaemon {
    /// Writes the configuration `text` to `path`, starts the DRA kubelet emulator on
    /// `root/registry` (as [`dra_section`] configures it), runs the daemon with `claims`, and
    /// waits up to `within` for `driver` to register; panics when it does not.
    pub(crate) async fn start(
        root: &Path,
        path: &Path,
        text: &str,
        driver: &str,
        claims: Arc<Claims>,
        within: Duration,
    ) -> Self {
        let config = write_config(path, text);
        let kubelet = DraKubelet::start(root.join("registry")).expect("the DRA kubelet emulator");
        let slices = Arc::new(Slices::default());
        let cluster = ClusterServices {
            claims: claims.clone(),
            slices: slices.clone(),
            events: None,
            api: None,
        };
        let daemon = Daemon::spawn(config, path, Some(cluster));
        wait_registered(&kubelet, driver, within).await;
        DraDaemon {
            kubelet,
            claims,
            slices,
            daemon,
        }
    }

    /// Stops the daemon, then the kubelet emulator; gives the claims back for a restart.
    pub(crate) async fn stop(self) -> Arc<Claims> {
        self.daemon.stop().await;
        self.kubelet.stop().await;
        self.claims
    }
}

/// Waits up to `within` until `driver` has registered with `kubelet`; panics when it has not,
/// with the registrations the kubelet refused.
pub(crate) async fn wait_registered(kubelet: &DraKubelet, driver: &str, within: Duration) {
    assert!(
        kubelet
            .wait_until(within, |k| k.drivers().contains_key(driver))
            .await,
        "the DRA driver {driver} did not register: {:?}",
        kubelet.rejected()
    );
}

/// Waits up to `within` until `kubelet`'s health stream from `driver` says `health` for the
/// device `key` (`pool/device`); panics when it does not, with what the stream said.
pub(crate) async fn wait_dra_health(
    kubelet: &DraKubelet,
    driver: &str,
    key: &str,
    health: &str,
    within: Duration,
) {
    assert!(
        kubelet
            .wait_until(within, |k| k
                .health(driver)
                .get(key)
                .is_some_and(|h| h.health == health))
            .await,
        "{key} never became {health} in the DRA health stream: {:?}",
        kubelet.health(driver)
    );
}

/// The `dra:` section of a daemon configuration: `driver` enabled, plugin sockets in
/// `plugin_dir`, and the registry, CDI directory and boot ID file below `root`.
pub(crate) fn dra_section(driver: &str, root: &Path, plugin_dir: &Path) -> String {
    format!(
        "dra:\n  enabled: true\n  driverName: {driver}\n  pluginDir: {p}\n  registryDir: {r}/registry\n  cdiDir: {r}/cdi\n  bootIdPath: {r}/boot_id\n",
        p = plugin_dir.display(),
        r = root.display()
    )
}

/// Writes `text` to `path` and loads it as the daemon's configuration; panics when it does not
/// load.
pub(crate) fn write_config(path: &Path, text: &str) -> Config {
    std::fs::write(path, text).expect("write the configuration");
    Config::load(path).expect("load the configuration")
}

/// The files in the CDI directory `dir`, sorted; none when it does not exist.
pub(crate) fn cdi_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The example policy `name`, compiled to WebAssembly (in `KUBEDEV_PLUGIN_DIR`, or else
/// `target/plugins/wasm`); panics saying how to build it when it is missing.
pub(crate) fn plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("KUBEDEV_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/plugins/wasm")
        });
    let p = dir.join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask build-plugins` first",
        p.display()
    );
    p
}

/// A selection policy that keeps the policy contract at load and traps on every call.
pub(crate) fn trapping_policy() -> Vec<u8> {
    wat::parse_str(
        r#"(module
          (memory (export "memory") 1)
          (func (export "kubedev_policy_abi_version") (result i32) (i32.const 1))
          (func (export "kubedev_alloc") (param i32) (result i32) (i32.const 1024))
          (func (export "kubedev_select") (param i32 i32) (result i64) (unreachable)))"#,
    )
    .expect("the trapping policy's text")
}

/// Runs `check` until it gives `Ok`, every 20 ms for at most `within`, and returns its value;
/// panics with the last `Err` (what is still missing) when the time is up.
pub(crate) async fn eventually<T, F>(within: Duration, mut check: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `GET path` on the daemon's HTTP endpoint at `127.0.0.1:port`: the status and the body, or
/// status 0 while nothing listens there.
pub(crate) fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .expect("sending the request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("reading the answer");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
/// The scheduler's part done by the allocator: a claim for MIG slices of a GPU published
/// as partitionable, allocated against the published counters; `allocated` lists devices
/// already in use. Returns the chosen devices.
pub(crate) fn schedule_mig(
    inv: &Inventory,
    driver_name: &str,
    profile: &str,
    count: u32,
    allocated: &[String],
) -> Vec<DeviceRef> {
    let driver = kubedev_core::DriverName::new(driver_name).unwrap();
    let mut slices = serde_json::to_value(
        kubedev_apiserver::render_slices(
            inv,
            &driver,
            "node-a",
            kubedev_apiserver::UnhealthyDevices::Omit,
        )
        .unwrap(),
    )
    .unwrap();
    for (i, s) in slices.as_array_mut().unwrap().iter_mut().enumerate() {
        s["metadata"]["name"] = format!("slice-{i}").into();
    }
    let scenario = serde_json::json!({
        "node": {"name": "node-a"},
        "deviceClasses": [{
            "metadata": {"name": "mig"},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver_name}\"")}}]},
        }],
        "resourceSlices": slices,
        "allocatedDevices": allocated,
        "claims": [{
            "metadata": {"name": "slices", "namespace": "default", "uid": "uid-sched"},
            "spec": {"devices": {"requests": [{
                "name": "mig",
                "exactly": {
                    "deviceClassName": "mig",
                    "allocationMode": "ExactCount",
                    "count": count,
                    "selectors": [{"cel": {"expression": format!(
                        "\"profile\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].profile == \"{profile}\""
                    )}}],
                },
            }]}},
        }],
    });
    let scenario: kubedev_allocator::Scenario = serde_json::from_value(scenario).unwrap();
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    let v: serde_json::Value = serde_json::from_str(&out.to_json()).unwrap();
    assert_eq!(v["allocatable"], true, "{v:#}");
    v["claims"][0]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            DeviceRef::new(
                kubedev_core::PoolName::new(r["pool"].as_str().unwrap()).unwrap(),
                kubedev_core::DeviceName::new(r["device"].as_str().unwrap()).unwrap(),
            )
        })
        .collect()
}
