//! The daemon against the API server of each supported Kubernetes release, with partitionable
//! MIG on a DGX A100 (GPUs 6 and 7 have MIG on) and a DeviceClass with an extended resource
//! name: what is stored must never let the scheduler hand out a GPU twice, the counter layout
//! must be the one the release accepts, and every field the server drops must be reported.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use kubedev_testkit::apiserver::{ApiServer, KubeRelease, Resource};
use kubedev_testkit::kubelet::DraKubelet;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(30);

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Run {
    root: tempfile::TempDir,
    api: ApiServer,
    _kubelet: DraKubelet,
    _daemon: Daemon,
    port: u16,
}

impl Run {
    async fn start(release: KubeRelease, gates: &[(&str, bool)]) -> Run {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mut builder = ApiServer::builder().kubernetes(release);
        for (gate, on) in gates {
            builder = builder.feature_gate(*gate, *on);
        }
        let api = builder.start().await.unwrap();
        api.write_kubeconfig(&r.join("kubeconfig")).unwrap();
        api.put_raw(
            Resource::Nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}),
        )
        .unwrap();
        std::fs::write(r.join("boot_id"), "5a0c2e9f-1111-4000-8000-00000000abcd\n").unwrap();
        let lib =
            nvml_mock::isolated_library(r, &nvml_mock::machine_path("dgx-a100"), None).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "nodeName: {NODE}
dra:
  enabled: true
  driverName: {DRIVER}
  kubeconfig: {r}/kubeconfig
  pluginDir: {r}/plugins
  registryDir: {r}/registry
  cdiDir: {r}/cdi
  stateDir: {r}/state
  bootIdPath: {r}/boot_id
  deviceClasses:
    - name: gpu.nvidia.com
      cel: device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"
      extendedResourceName: nvidia.com/gpu
backends:
  nvidia:
    libraryPath: {lib}
    migStrategy: partitionable
metrics:
  address: 127.0.0.1:{port}
",
            r = r.display(),
            lib = lib.display()
        );
        std::fs::write(r.join("kubedev.yaml"), config).unwrap();
        let kubelet = DraKubelet::start(r.join("registry")).unwrap();
        let log = std::fs::File::create(r.join("daemon.log")).unwrap();
        let daemon = Daemon(
            Command::new(env!("CARGO_BIN_EXE_kubedev"))
                .args(["run", "--config"])
                .arg(r.join("kubedev.yaml"))
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        Run {
            root,
            api,
            _kubelet: kubelet,
            _daemon: daemon,
            port,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("daemon.log")).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("daemon.log")
    }

    /// The stored slices of the driver's pool once they form a whole pool (every slice of the
    /// newest generation, as many as the pool says) that has not changed for half a second.
    async fn settled_slices(&self) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        let mut last: Option<Vec<Value>> = None;
        loop {
            let slices: Vec<Value> = self
                .api
                .objects(Resource::ResourceSlices)
                .into_iter()
                .filter(|s| s["spec"]["driver"] == DRIVER)
                .collect();
            let complete = !slices.is_empty() && {
                let top = slices
                    .iter()
                    .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap_or(0))
                    .max()
                    .unwrap();
                let newest: Vec<&Value> = slices
                    .iter()
                    .filter(|s| s["spec"]["pool"]["generation"].as_i64() == Some(top))
                    .collect();
                newest.len() == slices.len()
                    && newest.iter().all(|s| {
                        s["spec"]["pool"]["resourceSliceCount"].as_u64()
                            == Some(slices.len() as u64)
                    })
            };
            let specs =
                |v: &[Value]| -> Vec<Value> { v.iter().map(|s| s["spec"].clone()).collect() };
            if complete && last.as_ref().is_some_and(|l| specs(l) == specs(&slices)) {
                return slices;
            }
            assert!(
                Instant::now() < deadline,
                "slices never settled: {slices:#?}\n{}",
                self.log()
            );
            last = complete.then_some(slices);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn readyz(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, body) = common::http_get(self.port, "/readyz");
            if status == 200 {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "never ready: {body}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn metrics(&self) -> String {
        common::http_get(self.port, "/metrics").1
    }
}

/// Runs kubedev's allocator on the stored slices: one claim whose request selects `cel`, with
/// `allocated` devices already in use. Returns the devices chosen, or `None` when the claim
/// cannot be allocated.
fn allocate(slices: &[Value], cel: &str, allocated: &[String]) -> Option<Vec<String>> {
    let scenario = json!({
        "node": {"name": NODE},
        "deviceClasses": [{
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]},
        }],
        "resourceSlices": slices,
        "allocatedDevices": allocated,
        "claims": [{
            "metadata": {"name": "c", "namespace": "default", "uid": "uid-c"},
            "spec": {"devices": {"requests": [{
                "name": "r",
                "exactly": {
                    "deviceClassName": "gpu",
                    "allocationMode": "ExactCount",
                    "count": 1,
                    "selectors": [{"cel": {"expression": cel}}],
                },
            }]}},
        }],
    });
    let scenario: kubedev_allocator::Scenario = serde_json::from_value(scenario).unwrap();
    let out =
        kubedev_allocator::simulate(&scenario, &kubedev_allocator::SimulateOptions::default());
    let v: Value = serde_json::from_str(&out.to_json()).unwrap();
    if std::env::var_os("KUBEDEV_TEST_VERBOSE").is_some() {
        eprintln!("{cel} with {allocated:?}: {v:#}");
    }
    if v["allocatable"] != true {
        return None;
    }
    Some(
        v["claims"][0]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{DRIVER}/{}/{}",
                    r["pool"].as_str().unwrap(),
                    r["device"].as_str().unwrap()
                )
            })
            .collect(),
    )
}

const WHOLE_GPU_6: &str = "device.attributes[\"gpu.nvidia.com\"].type == \"gpu\" && device.attributes[\"gpu.nvidia.com\"].index == 6";
const MIG_OF_GPU_6: &str = "device.attributes[\"gpu.nvidia.com\"].type == \"mig\" && device.attributes[\"gpu.nvidia.com\"].parentIndex == 6";

/// Whatever is stored, GPU 6 is never given whole to one claim and in part to another, in
/// either order; returns whether MIG devices of it can be allocated at all.
fn no_double_allocation(slices: &[Value]) -> bool {
    let whole = allocate(slices, WHOLE_GPU_6, &[]).expect("the whole GPU 6 is allocatable");
    assert_eq!(
        allocate(slices, MIG_OF_GPU_6, &whole),
        None,
        "a MIG device of GPU 6 was allocatable while the whole GPU is in use"
    );
    match allocate(slices, MIG_OF_GPU_6, &[]) {
        Some(part) => {
            assert_eq!(
                allocate(slices, WHOLE_GPU_6, &part),
                None,
                "the whole GPU 6 was allocatable while {part:?} is in use"
            );
            true
        }
        None => false,
    }
}

fn devices(slice: &Value) -> &[Value] {
    slice["spec"]["devices"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

fn counter_sets(slice: &Value) -> Vec<&str> {
    slice["spec"]["sharedCounters"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect()
}

fn consumers(slices: &[Value]) -> usize {
    slices
        .iter()
        .flat_map(devices)
        .filter(|d| d["consumesCounters"].is_array())
        .count()
}

/// The checks of a release that keeps shared counters: MIG placements are published, consume
/// counters, and no GPU goes out twice.
fn counters_kept(slices: &[Value]) {
    assert!(consumers(slices) > 0, "no device consumes counters");
    assert!(
        no_double_allocation(slices),
        "MIG devices are not allocatable"
    );
}

/// The report of a missing feature: an ERROR line, the gauge, a `/readyz` note and an Event.
async fn reported(run: &Run, gate: &str, saying: &str) {
    // The report follows the publisher and the class applier asynchronously: wait for each
    // part of it (the Event is recorded last).
    common::eventually(WAIT, || {
        let ready = common::http_get(run.port, "/readyz").1;
        let note = ready
            .lines()
            .find(|l| l.starts_with("note: ") && l.contains(gate))
            .map(str::to_owned);
        let metrics = run.metrics();
        let line = format!("kubedev_api_feature_unavailable{{feature=\"{gate}\"}} 1");
        let logged = run
            .log()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains(gate));
        let events = run.api.objects(Resource::Events);
        let event = events.iter().any(|e| {
            e["reason"] == "FeatureUnavailable"
                && e["type"] == "Warning"
                && e["regarding"]["name"] == NODE
                && e["note"].as_str().unwrap_or("").contains(gate)
        });
        std::future::ready(match note {
            None => Err(format!("no note about {gate}: {ready}")),
            Some(n) if !n.contains(saying) => Err(format!("the note does not say {saying:?}: {n}")),
            Some(_) if !metrics.contains(&line) => Err(format!("{line} missing:\n{metrics}")),
            Some(_) if !logged => Err(format!(
                "no ERROR naming {gate} in {}",
                run.log_path().display()
            )),
            Some(_) if !event => Err(format!(
                "no FeatureUnavailable Event about {gate}: {events:#?}"
            )),
            Some(_) => Ok(()),
        })
    })
    .await;
    run.readyz().await;
}

/// Nothing reported: no note, no gauge at 1.
async fn nothing_reported(run: &Run) {
    let ready = run.readyz().await;
    assert!(!ready.contains("feature gate"), "{ready}");
    let metrics = run.metrics();
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("kubedev_api_feature_unavailable{") && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// The class as stored: whether it kept its extended resource name.
fn class_keeps_extended_resource(api: &ApiServer) -> bool {
    api.get(Resource::DeviceClasses, None, "gpu.nvidia.com")
        .map(|c| c["spec"]["extendedResourceName"] == "nvidia.com/gpu")
        .unwrap_or(false)
}

async fn wait_class(api: &ApiServer) {
    common::eventually(WAIT, || {
        std::future::ready(
            api.get(Resource::DeviceClasses, None, "gpu.nvidia.com")
                .map(|_| ())
                .ok_or_else(|| "class not applied".to_string()),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_34_with_default_gates_gets_whole_gpus_and_a_loud_report() {
    let run = Run::start(KubeRelease::V1_34, &[]).await;
    let slices = run.settled_slices().await;
    // Nothing consumes counters, no MIG placement is published: only whole GPUs.
    assert_eq!(consumers(&slices), 0);
    assert!(slices.iter().all(|s| counter_sets(s).is_empty()));
    assert!(!no_double_allocation(&slices));
    // GPUs 0-5 have MIG off, GPU 6 has MIG on and no instance (published whole), GPU 7 has
    // instances an administrator made (published as they are: static MIG).
    let names: Vec<&str> = slices
        .iter()
        .flat_map(devices)
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    let (whole, parts): (Vec<&str>, Vec<&str>) = names.iter().partition(|n| !n.contains("-mig-"));
    assert_eq!(
        whole,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6"
        ],
        "{names:?}"
    );
    assert!(
        !parts.is_empty() && parts.iter().all(|n| n.starts_with("gpu-7-mig-")),
        "{names:?}"
    );
    reported(&run, "DRAPartitionableDevices", "gpu-6").await;
    wait_class(&run.api).await;
    assert!(!class_keeps_extended_resource(&run.api));
    reported(&run, "DRAExtendedResource", "gpu.nvidia.com").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_34_with_partitionable_devices_gets_counters_beside_their_devices() {
    let run = Run::start(KubeRelease::V1_34, &[("DRAPartitionableDevices", true)]).await;
    let slices = run.settled_slices().await;
    counters_kept(&slices);
    for slice in &slices {
        let sets = counter_sets(slice);
        for d in devices(slice) {
            for c in d["consumesCounters"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
            {
                let set = c["counterSet"].as_str().unwrap();
                assert!(
                    sets.contains(&set),
                    "{} consumes {set} from another slice",
                    d["name"]
                );
            }
        }
        let counters: usize = slice["spec"]["sharedCounters"].as_array().map_or(0, |s| {
            s.iter()
                .map(|s| s["counters"].as_object().unwrap().len())
                .sum()
        });
        assert!(counters <= 32, "{counters} counters in one slice");
    }
    // The extended resource name is still dropped on 1.34.
    wait_class(&run.api).await;
    assert!(!class_keeps_extended_resource(&run.api));
    reported(&run, "DRAExtendedResource", "only ResourceClaims").await;
    let metrics = run.metrics();
    assert!(
        !metrics.contains("kubedev_api_feature_unavailable{feature=\"DRAPartitionableDevices\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_35_with_default_gates_gets_whole_gpus() {
    let run = Run::start(KubeRelease::V1_35, &[]).await;
    let slices = run.settled_slices().await;
    assert_eq!(consumers(&slices), 0);
    assert!(!no_double_allocation(&slices));
    reported(&run, "DRAPartitionableDevices", "gpu-6").await;
    reported(&run, "DRAExtendedResource", "gpu.nvidia.com").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_36_to_1_38_keep_everything_in_split_slices() {
    for release in [KubeRelease::V1_36, KubeRelease::V1_37, KubeRelease::V1_38] {
        let run = Run::start(release, &[]).await;
        let slices = run.settled_slices().await;
        counters_kept(&slices);
        for slice in &slices {
            assert!(
                devices(slice).is_empty() || counter_sets(slice).is_empty(),
                "{release:?}: a slice with devices and counter sets"
            );
        }
        wait_class(&run.api).await;
        assert!(class_keeps_extended_resource(&run.api), "{release:?}");
        nothing_reported(&run).await;
    }
}

/// The same checks without the daemon's help: an API server that drops counters, given what
/// kubedev used to write (counters and placements as independent devices), allows GPU 6 twice.
/// This is the failure the fallback prevents.
#[tokio::test]
async fn without_the_fallback_what_a_1_34_server_stores_allows_a_gpu_twice() {
    let lib_dir = tempfile::tempdir().unwrap();
    let lib =
        nvml_mock::isolated_library(lib_dir.path(), &nvml_mock::machine_path("dgx-a100"), None)
            .unwrap();
    let inventory = discover_partitionable(lib_dir.path(), &lib).await;
    let driver = kubedev_core::DriverName::new(DRIVER).unwrap();
    let mut slices = serde_json::to_value(
        kubedev_apiserver::render_slices(
            &inventory,
            &driver,
            NODE,
            kubedev_apiserver::UnhealthyDevices::Omit,
        )
        .unwrap(),
    )
    .unwrap();
    // What a server with DRAPartitionableDevices off stores of it.
    for (i, s) in slices.as_array_mut().unwrap().iter_mut().enumerate() {
        s["metadata"]["name"] = format!("slice-{i}").into();
        let spec = s["spec"].as_object_mut().unwrap();
        spec.remove("sharedCounters");
        if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
            for d in devices {
                d.as_object_mut().unwrap().remove("consumesCounters");
            }
        }
    }
    let slices = slices.as_array().unwrap().clone();
    let whole = allocate(&slices, WHOLE_GPU_6, &[]).unwrap();
    assert!(
        allocate(&slices, MIG_OF_GPU_6, &whole).is_some(),
        "expected the stripped slices to allow a MIG device beside the whole GPU"
    );
}

/// What the NVIDIA backend finds on the DGX stand-in with partitionable MIG.
async fn discover_partitionable(dir: &Path, lib: &Path) -> kubedev_core::Inventory {
    let path = dir.join("discover.yaml");
    let config = common::write_config(
        &path,
        &format!(
            "nodeName: {NODE}\nbackends:\n  nvidia:\n    libraryPath: {}\n    migStrategy: partitionable\n",
            lib.display()
        ),
    );
    kubedev::discover::discover(&config, &path)
        .await
        .unwrap()
        .inventory
}
