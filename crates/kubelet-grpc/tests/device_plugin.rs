//! The Device Plugin API over real Unix sockets, against the kubelet emulator.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kubedev_core::{ContainerEdits, DeviceNode, ExtendedResourceName, Health, Mount, PrepareError};
use kubedev_kubelet_grpc::device_plugin::{
    Allocation, DevicePlugin, DevicePluginConfig, DevicePluginHandle, DevicePluginHandler,
    PluginDevice, PreferenceRequest,
};
use kubedev_kubelet_grpc::pb::deviceplugin::v1beta1 as api;
use kubedev_testkit::kubelet::KubeletEmulator;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "example.com/dev";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Handler {
    allocations: AtomicUsize,
    pre_starts: AtomicUsize,
    pre_start: bool,
    policy: Option<Vec<String>>,
}

#[async_trait]
impl DevicePluginHandler for Handler {
    async fn allocate(&self, devices: &[PluginDevice]) -> Result<Allocation, PrepareError> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        let mut edits = ContainerEdits::default();
        let ids: Vec<_> = devices.iter().map(|d| d.id.as_str()).collect();
        edits.env.insert("DEVS".into(), ids.join(","));
        for d in devices {
            edits
                .device_nodes
                .push(DeviceNode::new(format!("/dev/{}", d.id), "rw"));
        }
        edits
            .mounts
            .push(Mount::bind("/opt/lib", "/usr/local/lib/dev", true));
        edits
            .annotations
            .insert("example.com/devs".into(), ids.join(","));
        Ok(Allocation {
            edits,
            cdi_devices: ids.iter().map(|i| format!("example.com/dev={i}")).collect(),
        })
    }

    async fn pre_start(&self, _devices: &[PluginDevice]) -> Result<(), PrepareError> {
        self.pre_starts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn needs_pre_start(&self) -> bool {
        self.pre_start
    }

    fn preferred_allocation(&self, _r: &PreferenceRequest<'_>) -> Option<Vec<String>> {
        self.policy.clone()
    }
}

/// The inventory device `name` of the pool `node-a`.
fn device_ref(name: &str) -> kubedev_core::DeviceRef {
    kubedev_core::DeviceRef::new(
        kubedev_core::PoolName::new("node-a").unwrap(),
        kubedev_core::DeviceName::new(name).unwrap(),
    )
}

fn devices(n: usize) -> Vec<PluginDevice> {
    (0..n)
        .map(|i| {
            PluginDevice::new(format!("dev-{i}"), device_ref(&format!("dev-{i}")))
                .with_numa_node(Some((i % 2) as i64))
        })
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    kubelet: KubeletEmulator,
    devices: watch::Sender<Vec<PluginDevice>>,
    plugin: Option<DevicePluginHandle>,
    handler: Arc<Handler>,
}

fn config(dir: &Path) -> DevicePluginConfig {
    DevicePluginConfig::new(ExtendedResourceName::new(RESOURCE).unwrap())
        .plugin_dir(dir)
        .register_backoff(vec![Duration::from_millis(50)])
}

async fn fixture_with(handler: Handler, n: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = KubeletEmulator::start(dir.path()).await.unwrap();
    let (tx, rx) = watch::channel(devices(n));
    let handler = Arc::new(handler);
    let plugin = DevicePlugin::start(
        config(dir.path()),
        handler.clone(),
        rx,
        CancellationToken::new(),
    )
    .unwrap();
    assert!(plugin.wait_registered(WAIT).await, "{:?}", plugin.status());
    kubelet
        .wait_for(RESOURCE, WAIT, |r| r.connected && r.snapshots >= 1)
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        kubelet,
        devices: tx,
        plugin: Some(plugin),
        handler,
    }
}

async fn fixture(n: usize) -> Fixture {
    fixture_with(Handler::default(), n).await
}

#[tokio::test]
async fn registers_with_version_endpoint_and_options() {
    let f = fixture(4).await;
    let regs = f.kubelet.registrations();
    assert_eq!(regs.len(), 1);
    assert_eq!(regs[0].version, "v1beta1");
    assert_eq!(regs[0].resource, RESOURCE);
    assert!(regs[0].rejected.is_none());
    let sock = f.plugin.as_ref().unwrap().socket_path();
    assert_eq!(
        regs[0].endpoint,
        sock.file_name().unwrap().to_str().unwrap()
    );
    let st = f.kubelet.resource(RESOURCE).unwrap();
    assert_eq!((st.capacity, st.allocatable), (4, 4));
    assert!(st.preferred_allocation_available);
    assert!(!st.pre_start_required);
    assert_eq!(st.devices["dev-1"].numa_nodes, [1]);
    let opts = f.kubelet.options(RESOURCE).await.unwrap();
    assert!(opts.get_preferred_allocation_available);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test]
async fn snapshots_follow_health_and_inventory_changes() {
    let f = fixture(3).await;
    f.devices
        .send_modify(|d| d[1].health = Health::unhealthy("fell off the bus"));
    let st = f
        .kubelet
        .wait_for(RESOURCE, WAIT, |r| r.allocatable == 2)
        .await
        .unwrap();
    assert_eq!(st.capacity, 3);
    assert_eq!(st.devices["dev-1"].health, "Unhealthy");
    // Recovery.
    f.devices.send_modify(|d| d[1].health = Health::healthy());
    f.kubelet
        .wait_for(RESOURCE, WAIT, |r| r.allocatable == 3)
        .await
        .unwrap();
    // A hot-plugged device appears, a removed one disappears: full snapshots each time.
    f.devices.send_modify(|d| {
        d.remove(0);
        d.push(PluginDevice::new("dev-9", device_ref("dev-9")));
    });
    let st = f
        .kubelet
        .wait_for(RESOURCE, WAIT, |r| r.devices.contains_key("dev-9"))
        .await
        .unwrap();
    assert!(!st.devices.contains_key("dev-0"));
    assert_eq!(st.capacity, 3);
    assert!(st.devices["dev-9"].numa_nodes.is_empty());
}

#[tokio::test]
async fn allocate_returns_edits_and_is_repeatable() {
    let f = fixture(4).await;
    let a = f
        .kubelet
        .allocate(RESOURCE, &["dev-2", "dev-0"])
        .await
        .unwrap();
    assert_eq!(a.envs["DEVS"], "dev-2,dev-0");
    let paths: Vec<_> = a
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/dev-2", "/dev/dev-0"]);
    assert_eq!(a.devices[0].host_path, "/dev/dev-2");
    assert_eq!(a.devices[0].permissions, "rw");
    assert_eq!(a.mounts[0].container_path, "/usr/local/lib/dev");
    assert!(a.mounts[0].read_only);
    assert_eq!(a.annotations["example.com/devs"], "dev-2,dev-0");
    assert_eq!(a.cdi_devices[1].name, "example.com/dev=dev-0");
    let again = f
        .kubelet
        .allocate(RESOURCE, &["dev-2", "dev-0"])
        .await
        .unwrap();
    assert_eq!(a, again);
    // Several containers in one request: one response each, in order.
    let req = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec!["dev-1".into()],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec!["dev-3".into()],
            },
        ],
    };
    let resp = f.kubelet.allocate_raw(RESOURCE, req).await.unwrap();
    assert_eq!(resp.container_responses.len(), 2);
    assert_eq!(resp.container_responses[1].envs["DEVS"], "dev-3");
}

#[tokio::test]
async fn allocate_rejects_unknown_unhealthy_and_malformed_requests() {
    let f = fixture(2).await;
    let err = f.kubelet.allocate(RESOURCE, &["dev-7"]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"dev-7\""), "{}", err.message());
    f.devices
        .send_modify(|d| d[0].health = Health::unhealthy("Xid 79"));
    let err = f.kubelet.allocate(RESOURCE, &["dev-0"]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("Xid 79"), "{}", err.message());
    let err = f.kubelet.allocate(RESOURCE, &[]).await.unwrap_err();
    assert!(
        err.message().contains("container_requests[0].devices_ids"),
        "{}",
        err.message()
    );
    let err = f
        .kubelet
        .allocate(RESOURCE, &["dev-1", "dev-1"])
        .await
        .unwrap_err();
    assert!(err.message().contains("twice"), "{}", err.message());
    let err = f
        .kubelet
        .preferred_allocation(RESOURCE, &["dev-1".into()], &[], -1)
        .await
        .unwrap_err();
    assert!(
        err.message().contains("allocation_size"),
        "{}",
        err.message()
    );
    // Nothing was handed to the handler, and the server keeps serving.
    assert_eq!(f.handler.allocations.load(Ordering::SeqCst), 0);
    f.kubelet.allocate(RESOURCE, &["dev-1"]).await.unwrap();
}

#[tokio::test]
async fn preferred_allocation_packs_numa_and_checks_policies() {
    let f = fixture(8).await;
    let all: Vec<String> = (0..8).map(|i| format!("dev-{i}")).collect();
    let got = f
        .kubelet
        .preferred_allocation(RESOURCE, &all, &["dev-3".into()], 3)
        .await
        .unwrap();
    assert_eq!(got, ["dev-3", "dev-1", "dev-5"]);

    // A policy answer that keeps the rules is used; one that breaks them is replaced.
    let good = Handler {
        policy: Some(vec!["dev-7".into(), "dev-0".into()]),
        ..Default::default()
    };
    let f = fixture_with(good, 8).await;
    let got = f
        .kubelet
        .preferred_allocation(RESOURCE, &all, &[], 2)
        .await
        .unwrap();
    assert_eq!(got, ["dev-7", "dev-0"]);
    let bad = Handler {
        policy: Some(vec!["dev-99".into()]),
        ..Default::default()
    };
    let f = fixture_with(bad, 8).await;
    let got = f
        .kubelet
        .preferred_allocation(RESOURCE, &all, &[], 1)
        .await
        .unwrap();
    assert_eq!(got, ["dev-0"]);
}

#[tokio::test]
async fn pre_start_runs_only_when_advertised() {
    let f = fixture_with(
        Handler {
            pre_start: true,
            ..Default::default()
        },
        2,
    )
    .await;
    assert!(f.kubelet.resource(RESOURCE).unwrap().pre_start_required);
    f.kubelet.pre_start(RESOURCE, &["dev-0"]).await.unwrap();
    assert_eq!(f.handler.pre_starts.load(Ordering::SeqCst), 1);
    let err = f.kubelet.pre_start(RESOURCE, &["nope"]).await.unwrap_err();
    assert!(err.message().contains("nope"));
}

#[tokio::test]
async fn re_registers_after_every_kubelet_restart() {
    let mut f = fixture(2).await;
    for i in 2..=101usize {
        let start = std::time::Instant::now();
        f.kubelet.restart().await.unwrap();
        assert!(
            f.kubelet
                .wait_registrations(i, Duration::from_secs(5))
                .await,
            "restart {i}: no re-registration; plugin status {:?}",
            f.plugin.as_ref().unwrap().status()
        );
        let st = f
            .kubelet
            .wait_for(RESOURCE, Duration::from_secs(5), |r| {
                r.connected && r.capacity == 2
            })
            .await;
        assert!(st.is_some(), "restart {i}: kubelet did not reconnect");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "restart {i} took {:?}",
            start.elapsed()
        );
    }
    assert_eq!(f.plugin.as_ref().unwrap().status().registrations, 101);
}

#[tokio::test]
async fn waits_for_an_absent_kubelet_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (_tx, rx) = watch::channel(devices(1));
    let plugin = DevicePlugin::start(
        config(dir.path()),
        Arc::new(Handler::default()),
        rx,
        CancellationToken::new(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = plugin.status();
    assert!(!st.registered);
    assert!(st.last_error.is_some());
    let kubelet = KubeletEmulator::start(dir.path()).await.unwrap();
    assert!(plugin.wait_registered(WAIT).await);
    let sock = plugin.socket_path().to_path_buf();
    assert!(sock.exists());
    plugin.stop().await;
    assert!(!sock.exists(), "socket left behind");
    kubelet.stop().await;
}

#[tokio::test]
async fn rejected_registration_is_retried_not_fatal() {
    // A resource name in the kubernetes.io domain cannot even be configured.
    assert!(ExtendedResourceName::new("kubernetes.io/dev").is_err());
    // The kubelet emulator rejects bad versions like the kubelet does.
    let f = fixture(1).await;
    let mut client = {
        let ch = tonic::transport::Endpoint::from_shared(format!(
            "unix://{}",
            f.kubelet.socket_path().display()
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
        api::registration_client::RegistrationClient::new(ch)
    };
    let err = client
        .register(api::RegisterRequest {
            version: "v1alpha".into(),
            endpoint: "x.sock".into(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("v1alpha"));
}

#[tokio::test]
async fn oversized_snapshot_is_refused_with_a_clear_error() {
    let f = fixture(1).await;
    let many: Vec<PluginDevice> = (0..30_000)
        .map(|i| {
            PluginDevice::new(format!("{i:0>150}"), device_ref(&format!("d{i}")))
                .with_numa_node(Some(0))
        })
        .collect();
    f.devices.send_replace(many);
    let st = f
        .kubelet
        .wait_for(RESOURCE, WAIT, |r| r.stream_error.is_some())
        .await
        .unwrap();
    let msg = st.stream_error.unwrap();
    assert!(msg.contains("4194304"), "{msg}");
    assert!(msg.contains("30000 devices"), "{msg}");
}
